"""Stored conversations and their messages, served with fresh links and stale flags."""
