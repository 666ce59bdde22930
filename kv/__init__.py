"""Where KV lives: its size (`capacity`) and its location (`placement`, in Redis)."""
