"""The requests we decode: the text workload and prompts from the command line."""
