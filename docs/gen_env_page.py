"""Write docs/guides/environment-variables.md from the one table of phalanx's variables
(``phalanx._foundation.env.VARIABLES``)::

    python docs/gen_env_page.py > docs/guides/environment-variables.md

``tests/test_env_table.py`` fails when the page and the table differ.
"""

from __future__ import annotations

from phalanx._foundation.env import VARIABLES

HEAD = """\
# Environment variables

Every `PHALANX_*` variable phalanx reads, with its default. Configuration belongs in the
configs (`ScalingConfig`, `RunConfig`, `FailureConfig`, ...); these variables change what a
config does not reach: where runs go by default, how workers start, bounds that protect a run,
the metrics endpoint. phalanx reads them in one module (`phalanx/_foundation/env.py`), and this
page is generated from its table (`python docs/gen_env_page.py`; a test checks it is current).

| variable | default | what it changes |
| --- | --- | --- |
"""

TAIL = """
phalanx also reads variables of other tools, with their meaning there: `RAY_ADDRESS` (set:
the Ray engine is chosen and connects to that cluster), `CUDA_VISIBLE_DEVICES` (the GPUs a
worker sees), `XDG_CACHE_HOME` (where the rank logs of a run on remote storage are kept,
`~/.cache` when unset) and `JAX_PLATFORMS` (yours wins over phalanx's choice for JAX workers).
The frameworks' own variables (`MASTER_ADDR`, `RANK`, `TF_CONFIG`, ...) are set in each worker by
its backend, as torchrun or Ray Train would set them.
"""


def render() -> str:
    rows = []
    for variable in VARIABLES:
        default = "unset" if variable.default is None else f"`{variable.default}`"
        meaning = variable.meaning
        if variable.set_by_phalanx:
            meaning += " Set by phalanx for its workers; not for you to set."
        rows.append(f"| `{variable.name}` | {default} | {meaning} |\n")
    return HEAD + "".join(rows) + TAIL


if __name__ == "__main__":
    print(render(), end="")
