"""The accepted format: optional +country, then 3-3-4 digits separated by - or space."""

import re

PHONE = re.compile(r"(\+\d{1,3}[- ])?\d{3}[- ]\d{3}[- ]\d{4}")
