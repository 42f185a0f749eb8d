"""What nac-drive reads and writes, safely: checkpoints (``checkpoint``: safetensors + JSON,
never executed), the Hugging Face Hub (``hub``), atomic writes (``atomic``), ZIP members that
may be hostile (``untrusted_zip``), JPEG headers (``jpeg``) and browser video (``video``). It
imports nothing of ``policy/``, which builds on it."""
