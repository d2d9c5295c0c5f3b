"""Routing of real runs: router traces, policy replay against Belady's optimum, `bevy-gguf trace`."""
