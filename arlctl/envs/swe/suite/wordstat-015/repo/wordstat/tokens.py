"""Split text into lowercase words."""


def words(text):
    return [w.strip(".,;:!?").lower() for w in text.split(" ")]
