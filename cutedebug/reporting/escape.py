"""Escaping for everything cutedebug writes for people: HTML, SVG (XML) and Markdown.

Scenario ids, descriptions, kernel paths, error messages and compiler output are the user's (or
a tool's) text: none of it may become markup. Links go only to relative paths or http(s) URLs,
never to ``javascript:`` or any other scheme.
"""

from __future__ import annotations

import html
import re
from urllib.parse import quote, urlsplit

# Characters XML 1.0 cannot carry even escaped (C0 controls other than tab, newline, return).
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
# Markdown punctuation that can start or end emphasis, code, a link or a table cell. An
# underscore inside a word (``consumer_wait``) is no emphasis in CommonMark and stays as is.
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z]))")


def xml_text(s: object) -> str:
    """Text content for HTML or SVG: ``& < >`` escaped, control characters dropped."""
    return html.escape(_XML_INVALID.sub("", str(s)), quote=False)


def xml_attr(s: object) -> str:
    """An attribute value (single or double quoted): quotes escaped too."""
    return html.escape(_XML_INVALID.sub("", str(s)), quote=True)


def safe_href(target: object) -> str | None:
    """``target`` as an href, or None when it must not be a link.

    Relative paths (percent-encoded, so ``?``/``#`` in a file name stay part of it) and
    http(s) URLs pass; a path whose first segment looks like a scheme (``a:b/x``) is refused; every other scheme (``javascript:``, ``data:``, ``file:``, ``vbscript:``)
    and anything with control characters or backslashes is refused.
    """
    s = str(target).strip()
    if not s or _XML_INVALID.search(s) or "\\" in s or any(c in s for c in "\t\r\n"):
        return None
    try:
        parts = urlsplit(s)
    except ValueError:
        return None  # not parseable as a URL (``//[``: an unclosed IPv6 host): no link
    if parts.scheme:
        if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
            return None
        return xml_attr(s)
    if s.startswith("//"):
        return None  # a scheme-relative URL: another host
    # A relative path, percent-encoded (a colon too: nothing in it can read as a scheme).
    return xml_attr(quote(s, safe="/._-~"))


def html_link(target: object, text: object) -> str:
    """``<a href=...>text</a>``, or the text alone when ``target`` is not a safe link."""
    href = safe_href(target)
    return f"<a href='{href}'>{xml_text(text)}</a>" if href else xml_text(text)


def md_text(s: object) -> str:
    """Inline Markdown text that renders as the characters given: HTML escaped (``& < >``),
    the punctuation of emphasis, code, links and tables backslash-escaped, line breaks folded
    (safe inside a table cell). For use inside a line: cutedebug never starts a line with
    user text, so ``#`` / ``>`` / list markers need no escape."""
    t = " ".join(_XML_INVALID.sub("", str(s)).replace("\r", "\n").split("\n"))
    t = _MD_SPECIAL.sub(r"\\\1", t)
    return html.escape(t, quote=False)


def md_code(s: object) -> str:
    """An inline code span holding ``s`` verbatim (a fence longer than any backtick run in it);
    ``|`` escaped and line breaks folded, so it is safe inside a table cell."""
    t = _XML_INVALID.sub("", str(s)).replace("\r", " ").replace("\n", " ")
    t = t.replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or not t.strip() else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def md_block(s: object, info: str = "") -> list[str]:
    """A fenced code block (as lines) holding ``s`` verbatim: nothing in it is Markdown or
    HTML, and no line of it can close the fence."""
    t = _XML_INVALID.sub("", str(s))
    longest = max((len(m) for m in re.findall(r"`{3,}", t)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, t.rstrip("\n"), fence]


def md_link(target: object, text: object) -> str:
    """``[text](target)`` for a safe relative path or http(s) URL, else the text alone."""
    href = safe_href(target)
    if not href:
        return md_text(text)
    return f"[{md_text(text)}](<{html.unescape(href).replace('>', '%3E')}>)"
