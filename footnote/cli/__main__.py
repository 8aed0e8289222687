from footnote.cli.main import app

app()
