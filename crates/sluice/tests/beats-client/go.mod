module sluice.test/beats-client

go 1.25

require github.com/elastic/go-lumber v0.1.0

require github.com/klauspost/compress v1.20.4 // indirect
