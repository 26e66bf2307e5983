"""telemetry: ``agent`` (one stdlib file shipped to every host, with the registry of
sources), ``deploy`` (copy, start, stop, pull it) and ``ingest`` (agent CSVs to the tidy
contract)."""
