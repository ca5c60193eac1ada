"""Event formats (JSON lines and Avro) and the event-file destination."""
