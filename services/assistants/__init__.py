"""Assistants and their settings."""
