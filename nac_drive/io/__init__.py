"""What nac-drive reads and writes, safely: checkpoints (``checkpoint``: safetensors + JSON,
never executed), the Hugging Face Hub (``hub``), atomic writes (``atomic``), ZIP members that
may be hostile (``untrusted_zip``), files read with a cap (``capped_read``), JSON read with its
nesting bounded (``bounded_json``) and written strict (``strict_json``), JPEG headers (``jpeg``)
and browser video (``video``). It imports nothing of ``policy/``, which builds on it."""
