"""Call a function until it succeeds, sleeping between attempts."""

from backoff.delays import delay_for


def retry(fn, attempts, sleep, base=1.0, cap=30.0):
    for attempt in range(attempts):
        try:
            return fn()
        except Exception:
            if attempt == attempts - 1:
                raise
            sleep(delay_for(attempt, base, cap))
