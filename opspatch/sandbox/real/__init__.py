"""Real SGLang in the sandbox, on the CPU: `opspatch sandbox up --engine sglang`.

`release` says which engine a sandbox runs and what a real release needs (pure); `build` makes
the release's shared environment once, cached outside the repository; `hostenv` gives each host
its small layer on top (its own `sglang`, opspatch's CPU kernel layer and platform plugin);
`models` makes the sandbox's tiny Llama and EAGLE-3 draft; `launch` says how a server is started
(pure) and `server` starts and stops one directly. `engine_files/` is package data copied into
engine environments only: opspatch never imports it (its `sgl_kernel` must never shadow a real
one on an operator's machine).
"""
