"""hwbridge: hardware and market inputs (MQTT telemetry, market feeds) forwarded to poirotd."""
