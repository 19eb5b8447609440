"""Scheduler loops: the asynchronous AES-RL loop and the synchronous baselines' loops."""
