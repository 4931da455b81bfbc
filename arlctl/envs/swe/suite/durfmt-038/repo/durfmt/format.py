"""Seconds -> "1h 2m 3s" (zero parts omitted, "0s" for zero)."""


def format_duration(seconds):
    if seconds < 0:
        raise ValueError("negative duration")
    hours = seconds // 3600
    minutes = seconds // 60
    secs = seconds % 60
    parts = [f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return " ".join(parts) or "0s"
