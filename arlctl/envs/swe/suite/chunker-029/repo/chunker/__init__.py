"""chunker: split sequences into fixed-size pieces."""

from chunker.split import batched_sum, chunks

__all__ = ["chunks", "batched_sum"]
