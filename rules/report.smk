# The comparison of the experiment's systems (asrflow compare, from MLflow) and the
# figures `snakemake --report report.html` embeds.
from pathlib import Path


rule compare:
    input:
        score_targets(config),
    output:
        table=report(f"{RESULTS}/compare/table.html", category="Comparison", caption="../workflow/report/table.rst"),
        markdown=f"{RESULTS}/compare/table.md",
        csv=f"{RESULTS}/compare/table.csv",
        wer=report(f"{RESULTS}/compare/wer.png", category="Comparison", caption="../workflow/report/wer.rst"),
        curves=report(
            f"{RESULTS}/compare/training_curves.png", category="Training", caption="../workflow/report/curves.rst"
        ),
    params:
        config=RESOLVED,
        experiment=config["experiment"],
        systems=" ".join(config["evaluation"]["systems"]),
        tests=" ".join(config["evaluation"]["test_sets"]),
        out=lambda wildcards, output: Path(output.table).parent,
    log:
        f"{RESULTS}/logs/compare.log",
    conda:
        "../envs/cpu.yaml"
    shell:
        "asrflow compare {params.experiment} --config {params.config} --systems {params.systems}"
        " --tests {params.tests} --out {params.out} --plots > {log} 2>&1"
