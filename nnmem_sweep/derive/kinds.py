"""The kinds of storage a traced step holds (derive/step.py tells them apart), shared by every module that reads
traces or plans; no torch here."""
PARAM, BUFFER, INPUT, GRAD, ACT, TEMP, KV = "param", "buffer", "input", "grad", "act", "temp", "kv"
