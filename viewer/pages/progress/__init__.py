"""The progress state of a page whose results are computed in the background."""
