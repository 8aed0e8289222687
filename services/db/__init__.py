"""SQL storage: typed models, engine and session handling, migrations."""
