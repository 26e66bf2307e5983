"""known_hosts lines as OpenSSH writes them with ``HashKnownHosts``."""

import base64
import hashlib
import hmac


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
