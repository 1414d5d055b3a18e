"""`batchpilot serve`'s settings (control/serve/settings.py): the URL its ready line gives
clients, and the values `validate()` takes at their bounds."""

from __future__ import annotations

import pytest

from control.serve.settings import ServeSettings


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8123"), ("::1", "http://[::1]:8123"),
    ("fe80::1", "http://[fe80::1]:8123"), ("localhost", "http://localhost:8123")])
def test_the_url_brackets_an_ipv6_host(host, url):
    """The ready line's URL is one a client can open: an IPv6 address in brackets (an
    unbracketed "::1:8123" reads as an address, with no port)."""
    assert ServeSettings(host=host, port=8123).url == url


def test_a_shutdown_grace_of_zero_is_taken_and_a_negative_one_refused():
    """`--shutdown-grace-s 0` ends the requests in flight at once on SIGTERM: a valid
    choice; below 0 is an error naming the setting."""
    assert ServeSettings(shutdown_grace_s=0.0).validate().shutdown_grace_s == 0.0
    with pytest.raises(ValueError, match="shutdown_grace_s"):
        ServeSettings(shutdown_grace_s=-1.0).validate()
