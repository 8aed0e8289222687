"""The one error of the embedded stack."""


class StackError(RuntimeError):
    """A component of the embedded stack failed to start or the state dir is unusable."""
