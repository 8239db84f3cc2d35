"""mkdocs hooks for the documentation site (``hooks:`` in mkdocs.yml).

The docstrings cross-reference with Sphinx roles (``:func:`name```), which read well in the source
and in ``help()``, but mkdocstrings renders them as text (``:func:<code>name</code>``). This turns
each into the code span it stands for, so the API page reads ``name``; a leading ``~`` (Sphinx's
"show the last part") keeps the last dotted part.
"""

import re

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _span(match: re.Match) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def strip_roles(html: str) -> str:
    """``html`` with every rendered Sphinx role turned into its code span."""
    return ROLE.sub(_span, html)


def on_page_content(html, page, config, files):  # noqa: ARG001 (mkdocs' hook signature)
    return strip_roles(html)
