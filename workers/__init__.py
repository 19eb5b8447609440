"""Worker-side code: RQ job functions, the AesrlWorker class, and the critic daemon."""

from workers.worker import AesrlWorker, AllowlistJob

__all__ = ["AesrlWorker", "AllowlistJob"]
