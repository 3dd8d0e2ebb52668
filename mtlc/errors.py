"""How a script ends when it cannot go on: one line, no traceback, and an exit code that says why."""
import click


class OneLineError(click.ClickException):
    """Shown as one line whatever it quotes: a control character of a stranger's file name or file (a
    newline, an ESC) is shown escaped, never sent to the terminal as itself."""

    def format_message(self):
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in super().format_message())


class UserError(OneLineError):
    """A problem with the user's input or files: exit code 2."""
    exit_code = 2


class WriteFailed(OneLineError):
    """A file could not be written (a full disk, a file-size or quota limit, no permission): exit
    code 1, naming the file and the OS's reason. Nothing of the file is left behind, and the files
    written before it are whole."""
    exit_code = 1

    def __init__(self, path, error, after="nothing of it was left behind; the files written before it are complete"):
        self.errno = error.errno
        super().__init__(f"cannot write {path}: {error.strerror or error} ({after})")


class TrainingFailed(OneLineError):
    """Training went wrong (a non-finite loss, collapsed features): exit code 3, checkpoints kept."""
    exit_code = 3


class MoveFailed(OneLineError):
    """The OS refused a move of label.py or its log (a full disk, a read-only file system): exit
    code 1, the folder as it was before the batch (or, where even that failed, where each file is)."""
    exit_code = 1
