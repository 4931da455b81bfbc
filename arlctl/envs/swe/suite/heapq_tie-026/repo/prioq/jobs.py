"""Jobs are plain objects without ordering."""


class Job:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Job({self.name!r})"
