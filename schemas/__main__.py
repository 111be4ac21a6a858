"""``python -m structgen.schemas``: rewrite the JSON Schema files from the models."""

from structgen.schemas import write_json_files

write_json_files()
