"""hosts: how the controller reaches a machine. ``transport`` (Result, errors, local),
``ssh`` (paramiko), ``known_hosts`` (OpenSSH's file, read whole, only appended to),
``clock`` (a host's clock offset, NTP-style) and ``host`` (container prefix, root, the
choice of transport)."""
