"""Compat tier: pods written as KAI-Scheduler's and HAMi's documentation shows them, against gpupack."""
