"""Test errors of checkpoints: student and teacher, in eval mode, on the dataset's test set.

    python evaluate.py --ckpt lc.pt
    python evaluate.py --ckpt lc.pt --json     # one JSON object on the last line
    python evaluate.py --ckpt runs/mt1/mt_final.pt --ckpt runs/mt2/mt_final.pt   # and mean +- std
"""
import json
import statistics

import click
import torch

import common


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--ckpt", "ckpts", type=click.Path(dir_okay=False), required=True, multiple=True,
              help="A checkpoint written by train_mt.py or finetune_lc.py (repeat for several).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per checkpoint instead of text.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Dataset folder. [default: the checkpoint's]")
@click.option("--seed", type=int, default=0, help="Seed of anything random (the errors themselves are deterministic).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", help="auto: CUDA when available.")
def main(ckpts, as_json, data_dir, seed, device):
    """Print the test error (%) of the student and the teacher of each checkpoint."""
    torch.manual_seed(seed)
    device = common.pick_device(device)
    states = [common.load_checkpoint(path) for path in ckpts]  # every file checked before any work
    results = []
    for path, state in zip(ckpts, states):
        config = state["config"]
        data = common.restore_data(state, data_dir)
        student, teacher = common.restore_models(state, device)
        mean, std = (torch.tensor(config[k], device=device) for k in ("mean", "std"))
        x, y = data.test_x.to(device), data.test_y.to(device)
        result = dict(checkpoint=str(path), dataset=config["dataset"], labels=config["labels"],
                      stage=state["stage"], epoch=state["epoch"], n_test=len(y),
                      student_error=common.test_error(student, x, y, mean, std),
                      teacher_error=common.test_error(teacher, x, y, mean, std))
        results.append(result)
        if as_json:
            click.echo(json.dumps(result))
        else:
            click.echo(f"{path}: {config['dataset']}, {config['labels']} labels, {state['stage']} epoch "
                       f"{state['epoch']}: test error student {result['student_error']:.2f}% "
                       f"teacher {result['teacher_error']:.2f}% ({len(y)} test images)")
    if len(results) > 1:
        summary = {"n_checkpoints": len(results)}
        for model in ("student", "teacher"):
            errors = [r[f"{model}_error"] for r in results]
            summary[f"{model}_error_mean"] = statistics.mean(errors)
            summary[f"{model}_error_std"] = statistics.stdev(errors)  # sample std, as papers report it
        if as_json:
            click.echo(json.dumps(summary))
        else:
            click.echo(f"mean +- std over {len(results)} checkpoints: "
                       f"student {summary['student_error_mean']:.2f} +- {summary['student_error_std']:.2f}%, "
                       f"teacher {summary['teacher_error_mean']:.2f} +- {summary['teacher_error_std']:.2f}%")


if __name__ == "__main__":
    main()
