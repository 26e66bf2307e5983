"""hosts: how the controller reaches a machine. ``transport`` (Result, errors, local),
``ssh`` (paramiko), and ``host`` (container prefix, root, the choice of transport)."""
