"""The per-session graph: turn detection -> STT -> LLM -> TTS -> audio output."""
