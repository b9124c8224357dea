"""Service room: render the SGLang unit and env file, lint them, drive systemctl on a host."""
