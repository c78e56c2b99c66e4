"""The error the CLI prints as one line, without a traceback: the user can act on it."""


class EagleboxError(RuntimeError):
    pass
