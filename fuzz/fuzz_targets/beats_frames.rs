#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::beats_frames(data));
