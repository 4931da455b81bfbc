"""gradebook: averages and letter grades."""

from gradebook.averages import weighted_average
from gradebook.letters import letter

__all__ = ["weighted_average", "letter"]
