"""Generators: the extractive default and OpenAI-compatible chat-completions servers."""
