"""Response header values from text a client or an operator chose (tenant and lane names,
request field names): HTTP/1 headers are Latin-1 bytes without control characters."""

from __future__ import annotations

import urllib.parse


def header_text(value: str) -> str:
    """`value` as a response header can carry it: printable ASCII as it is, anything else
    (a tenant named in any script, from `user` or a UTF-8 X-Tenant) percent-encoded as
    UTF-8, as RFC 8187 does, so `urllib.parse.unquote` gives the name back. HTTP/1 headers
    are Latin-1 bytes: a raw "用户" cannot be sent at all."""
    if value.isascii() and value.isprintable() and "%" not in value:
        return value
    return urllib.parse.quote(value, safe=" !\"#$&'()*+,/:;<=>?@[\\]^_`{|}~")
