module sluice.bench/beats-load

go 1.21

require github.com/elastic/go-lumber v0.1.0

// go-lumber v0.1.0 has no go.mod of its own; its zlib comes from here, kept at a version that
// builds with Go 1.21 (the same pins as the Beats test client).
require github.com/klauspost/compress v1.17.11 // indirect
