"""Build a tag with escaped content and attributes."""

from htmlsafe.escape import escape


def tag(name, content="", **attrs):
    attr_text = "".join(f' {k}="{escape(str(v))}"' for k, v in sorted(attrs.items()))
    return f"<{name}{attr_text}>{escape(content)}</{name}>"
