"""`bevy-gguf serve`: an OpenAI-compatible server over the bevy engine (continuous batching)."""
