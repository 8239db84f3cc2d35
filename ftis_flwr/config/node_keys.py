"""A model card pinned to one SuperNode's public key: only that SuperNode may claim the card.

Why: in an authenticated deployment (SuperLink ``--enable-supernode-auth``) the SuperLink admits
only the SuperNodes whose keys the operator registered, but any admitted SuperNode can still name
any card in its HELLO answer. A card's ``public_key`` (the text of the SuperNode's OpenSSH ``.pub``
file) closes that: the strategy reads each node's key from Flower's own records
(``Grid.get_nodes()``, ``NodeInfo.public_key``, PEM) and binds a pinned card only to the node id
whose key is the pinned one. Keys are compared as DER SubjectPublicKeyInfo, whatever their text.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.hazmat.primitives import serialization


class PinError(ValueError):
    """A pinned key that cannot be read; the message says why."""


def pinned_der(text: str) -> bytes:
    """DER of an OpenSSH public key line (``ecdsa-sha2-nistp384 AAAA... comment``) or a PEM key."""
    data = text.strip().encode()
    try:
        if data.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_ssh_public_key(data)
    except Exception as exc:  # whatever the text is, the message names the field's form
        raise PinError(f"not an OpenSSH public key line or a PEM public key ({exc})") from None
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def node_der(pem: bytes) -> bytes | None:
    """DER of the key Flower reports for a node (PEM), or None when it has none or is unreadable."""
    if not pem:
        return None
    try:
        key = serialization.load_pem_public_key(bytes(pem))
    except Exception:  # a node without a readable key cannot claim a pinned card
        return None
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(der: bytes | None) -> str:
    """``SHA256:<base64>`` of a key's DER (what a log line shows instead of the whole key)."""
    if der is None:
        return "no key"
    return "SHA256:" + base64.b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")


def node_keys(grid) -> dict[int, bytes | None]:
    """Node id -> DER of its public key, from ``grid.get_nodes()`` (Flower 1.42); {} where the grid
    cannot say (then no node can claim a pinned card)."""
    try:
        return {int(n.node_id): node_der(getattr(n, "public_key", b"")) for n in grid.get_nodes()}
    except Exception:  # an older or test grid without get_nodes: no keys known
        return {}
