//! The beats input's stream decoder (Lumberjack v2 frames, nested zlib blocks, JSON events),
//! through `sluice_inputs::beats_decode_for_fuzzing`, which reads a client's bytes the way a
//! connection does, under a frame and window limit: it must return, never panic or loop.

use sluice_inputs::beats_decode_for_fuzzing;

pub fn beats_frames(data: &[u8]) {
    let (events, refused) = beats_decode_for_fuzzing(data);
    // A `J` frame takes at least 10 bytes; a stream too short to hold one gives no event.
    if data.len() < 10 {
        assert_eq!(events, 0, "an event from {} bytes (refused: {refused})", data.len());
    }
}
