"""Chat: retrieval, generation and citations for one answer, and its storage."""
