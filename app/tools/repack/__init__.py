"""Repack: free whole GPUs (or nodes) by evicting pods their controllers re-create elsewhere."""
