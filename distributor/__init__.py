"""The barrier-mode launch engine: start N rank processes, stream their output, return results."""
