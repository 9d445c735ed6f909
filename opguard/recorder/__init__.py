"""Recording a PyTorch process into a trace. Imports torch; never imports a front end."""

from .session import RecordingSession, record, step

__all__ = ["RecordingSession", "record", "step"]
