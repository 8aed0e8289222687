"""Developer tooling: the embedded stack, `footnote dev`, the demo and the local LLM.

Nothing in `services/` or `workers/` imports this package; a production install leaves out the
servers it starts (the `embedded` extra).
"""
