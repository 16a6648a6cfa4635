"""A listen address, ``HOST:PORT`` (``[::1]:PORT`` for IPv6): the one parser every part of the
edge uses — the schema's check, the loopback rules, the listeners and the CLI (pure)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["ListenAddress"]

_RULE = "must be HOST:PORT with a port from 0 to 65535 (IPv6 as [::1]:PORT)"


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """``host`` without brackets, ``port`` 0–65535 (0: any free port)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ListenAddress:
        """Parse ``HOST:PORT``; :class:`ValueError` says what is wrong (the message goes on
        after the value's path: "… is not a listen address; {field} must be …")."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isascii() or not port.isdigit():
            raise ValueError(f"is not a listen address; {{field}} {_RULE}")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"is not a listen address; {{field}} {_RULE}")
        bracketed = host.startswith("[") and host.endswith("]")
        if ":" in host and not bracketed:
            raise ValueError("an IPv6 host must be written in brackets, as [::1]:PORT")
        return cls(host[1:-1] if bracketed else host, int(port))

    @property
    def is_loopback(self) -> bool:
        """Only this machine can connect (``localhost``, ``127.x.y.z``, ``::1``)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def is_wildcard(self) -> bool:
        """Every interface (``0.0.0.0``, ``::``)."""
        return self.host in ("0.0.0.0", "::", "")

    def url(self, scheme: str = "http") -> str:
        """``scheme://host:port`` (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.url().partition("://")[2]
