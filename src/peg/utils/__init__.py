"""Small utilities every layer may use: they import nothing of peg (atomic writes and
safetensors + JSON states: `io`; the machine and code a result came from: `env`; progress bars:
`progress`; free memory and the one refusal of an allocation: `memory`; checks of scalar
arguments: `scalars`; lazily imported dependencies: `imports`; escaped HTML and markdown:
`html`)."""
