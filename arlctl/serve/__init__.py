"""`arlctl serve`: an OpenAI-compatible endpoint over any inference backend that records sessions as trajectories."""
