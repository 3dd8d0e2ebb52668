"""What a Label Studio ML backend answers, as Label Studio's own client calls it (label_studio/ml/
api_connector.py and models.py of the pip package label-studio; the SDK HumanSignal/label-studio-
ml-backend serves the same routes): GET /health; POST /setup {project, schema: the labeling config}
-> {model_version}; POST /predict {tasks, label_config} -> {results: one prediction per task,
{result, score, model_version}}; POST /webhook {action, annotation, task} for ANNOTATION_CREATED,
ANNOTATION_UPDATED and START_TRAINING; POST /train {annotations: tasks with their annotations}
(Label Studio's "Start training" where its webhook flag is off). A request Label Studio should
show refuses with BadRequest: the server answers 400, the line as the HTTP reason, which Label
Studio's client puts in the message it shows.
"""
import os
import threading
import xml.etree.ElementTree as ElementTree

from ..data.files import file_digest
from ..errors import UserError, WriteFailed
from ..use.label_studio import choice, is_true
from .task_images import Refused, task_image

MAX_CONFIG_CHARS = 2 ** 20
ANNOTATION_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED")
MAX_TASKS = 100_000  # tasks one /predict answers (a million-image project retrieves its predictions in parts)
CHUNK_TASKS, CHUNK_BYTES = 64, 256 * 2 ** 20  # images read and answered at once
PREDICTING = 2  # /predict requests answered at once; others wait their turn


class BadRequest(Exception):
    """A request this backend refuses: status and the line said."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.message, self.status = message, status


class Controls:
    """What a labeling config asks: the Choices control (from_name), the Image it labels (to_name),
    the task data key of that image, and the choices."""

    def __init__(self, config):
        if not isinstance(config, str) or not config.strip():
            raise BadRequest("no labeling config was sent")
        if len(config) > MAX_CONFIG_CHARS or "<!DOCTYPE" in config.upper() or "<!ENTITY" in config.upper():
            raise BadRequest("the labeling config is too long or declares entities: it is not one Label Studio writes")
        try:
            root = ElementTree.fromstring(config)
        except ElementTree.ParseError as exc:
            raise BadRequest(f"the labeling config is not XML ({exc})") from None
        images = {e.get("name"): e.get("value", "") for e in root.iter("Image")}
        controls = [e for e in root.iter("Choices") if e.get("toName") in images]
        if len(controls) != 1:
            raise BadRequest(f"the labeling config has {len(controls)} Choices controls labeling an Image; this backend "
                             f"answers one (evaluate.py --label-studio writes it: the image, one choice among the classes)")
        control = controls[0]
        self.from_name, self.to_name = control.get("name"), control.get("toName")
        self.image_key = images[self.to_name].lstrip("$")
        self.choices = [c.get("value", c.get("alias", "")) for c in control.iter("Choice")]

    def check(self, classes):
        """BadRequest where the choices are not the checkpoint's classes (in any order)."""
        if sorted(self.choices) != sorted(classes):
            missing = [c for c in classes if c not in self.choices]
            extra = [c for c in self.choices if c not in classes]
            raise BadRequest("the labeling config's choices are not the checkpoint's classes: "
                             + "; ".join(part for part in (
                                 f"missing {', '.join(missing)}" if missing else "",
                                 f"not classes of the checkpoint: {', '.join(extra)}" if extra else "") if part)
                             + " (paste the config evaluate.py --label-studio wrote, tasks.label-config.xml)")


def json_object(body, what):
    if not isinstance(body, dict):
        raise BadRequest(f"the {what} request is not a JSON object")
    return body


class StudioBackend:
    """A LiveModel served to Label Studio, the labels it is given kept (KeptLabels) and trained on
    (LiveTraining, or None where the model does not learn live)."""

    def __init__(self, model, labels, training, folder, root, echo):
        self.model, self.labels, self.training = model, labels, training
        self.folder, self.root, self.echo = folder, root, echo
        self.configs = {}  # labeling config text -> Controls (a project sends its config with each request)
        self.predicting = threading.BoundedSemaphore(PREDICTING)

    def controls(self, config):
        """The Controls of a project's labeling config (the last one known where none is sent)."""
        known = self.configs  # one dict read: another thread may put another project's in its place
        if config is not None and not isinstance(config, str):
            raise BadRequest(f"the labeling config is not text ({type(config).__name__})")
        if not config and known:
            return next(iter(known.values()))
        controls = known.get(config)
        if controls is None:
            controls = Controls(config)
            controls.check(self.model.classes)
            self.configs = {config: controls}  # one project's config, kept while it is sent unchanged
        return controls

    def health(self):
        return {"status": "UP", "model_class": "mtlc", "model_version": self.model.current.name,
                "learning": self.learning()}

    def learning(self):
        if self.training is None:
            return f"does not learn live: {self.model.why_not_live}"
        return self.training.status

    def setup(self, body):
        body = json_object(body, "setup")
        self.controls(body.get("schema"))
        return {"model_version": self.model.current.name}

    def predict(self, body):
        """A prediction for each task, its images read, decoded and answered a chunk at a time (Label
        Studio sends every task it retrieves predictions for in one request), at most PREDICTING
        requests at once: memory stays at a few chunks of images."""
        body = json_object(body, "predict")
        controls = self.controls(body.get("label_config"))
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise BadRequest("the predict request has no tasks (a list)")
        if len(tasks) > MAX_TASKS:
            raise BadRequest(f"{len(tasks):,} tasks in one request, over the {MAX_TASKS:,} this backend answers at once",
                             status=413)
        results, chunk, size = [None] * len(tasks), [], 0
        with self.predicting:
            for i, task in enumerate(tasks):
                try:
                    image = task_image(task.get("data") if isinstance(task, dict) else None, self.folder, self.root,
                                       controls.image_key)[1]
                except Refused as exc:
                    results[i] = self.refused(task, str(exc))
                    continue
                chunk.append((i, image))
                size += len(image)
                if len(chunk) == CHUNK_TASKS or size >= CHUNK_BYTES:
                    self.answer(chunk, tasks, results, controls)
                    chunk, size = [], 0
            if chunk:
                self.answer(chunk, tasks, results, controls)
        return {"results": results}

    def answer(self, chunk, tasks, results, controls):
        """Fill in the results of a chunk [(task position, image bytes)]."""
        answers = self.model.answers([image for _, image in chunk])
        for (i, _), answer in zip(chunk, answers):
            if isinstance(answer, str):
                results[i] = self.refused(tasks[i], f"the image cannot be decoded: {answer}")
            else:
                results[i] = {"result": [{"from_name": controls.from_name, "to_name": controls.to_name,
                                          "type": "choices", "value": {"choices": [answer.label]}}],
                              "score": answer.score, "model_version": answer.version}

    def refused(self, task, why):
        """A task's empty prediction, no score (it sorts with the tasks never predicted), the reason
        said in the log (Label Studio keeps a prediction's result, score and version alone)."""
        self.echo(f"predict: task {task_id(task)} gets no prediction: {why}")
        return {"result": [], "score": None, "model_version": self.model.current.name, "error": why}

    def webhook(self, body):
        body = json_object(body, "webhook")
        action = body.get("action")
        if action == "START_TRAINING":
            return self.retrain()
        if action not in ANNOTATION_ACTIONS:
            return {"status": "ignored", "action": str(action)[:80]}
        annotations, tasks = body.get("annotation"), body.get("task")
        if action == "ANNOTATIONS_CREATED":  # the Data Manager's "create annotations from predictions": lists
            if not isinstance(annotations, list) or not isinstance(tasks, list):
                raise BadRequest(f"the {action} webhook has no annotations and tasks (lists)")
            by_id = {t.get("id"): t for t in tasks if isinstance(t, dict) and is_task_id(t.get("id"))}
            pairs = [(by_id.get(a.get("task")) if is_task_id(a.get("task")) else None, a) for a in annotations
                     if isinstance(a, dict)]
        else:
            pairs = [(tasks, annotations)]
        if any(not isinstance(task, dict) or not isinstance(annotation, dict) for task, annotation in pairs):
            raise BadRequest(f"the {action} webhook has no annotation and task (JSON objects)")
        project = body.get("project")
        config = project.get("label_config") if isinstance(project, dict) else None
        kept = self.keep_all(pairs, config)
        return dict(kept, **self.retrain()) if kept["kept"] else kept

    def train(self, body):
        """Label Studio's "Start training" without its webhook flag: every annotated task is sent."""
        body = json_object(body, "train")
        tasks = body.get("annotations")
        if not isinstance(tasks, list):
            raise BadRequest("the train request has no annotations (a list of tasks)")
        pairs = []
        for task in tasks:
            annotations = task.get("annotations") if isinstance(task, dict) else None
            if not isinstance(annotations, list):  # no task of Label Studio's: said, the others kept
                annotations = []
                self.echo(f"train: task {task_id(task)} has no annotations (a list): left out")
            latest = [a for a in annotations if isinstance(a, dict) and not is_true(a.get("was_cancelled"))]
            if latest:
                pairs.append((task, max(latest, key=lambda a: str(a.get("created_at") or ""))))
        return dict(self.keep_all(pairs, body.get("label_config"), one_by_one=False), **self.retrain())

    def keep_all(self, pairs, config, one_by_one=True):
        """Keep the class each (task, annotation) gives its image, in one write, before answering; a
        pair that cannot be kept is refused (one_by_one: the request; else that pair alone, counted)."""
        rows, refused, skipped, held = {}, [], 0, 0
        for task, annotation in pairs:
            try:
                row = self.label_of(task, annotation, config)
            except BadRequest as exc:
                if one_by_one:
                    raise
                refused.append(exc.message)
                continue
            if row is None:
                skipped += 1
                continue
            path, label, digest, held_out = row
            rows[path] = (label, digest)
            held += held_out
        if rows:
            try:
                self.labels.keep(rows)
            except (WriteFailed, UserError) as exc:  # the server's paths stay in its log, never sent
                self.echo(f"the labels could not be kept: {exc.format_message()}")
                why = os.strerror(exc.errno) if getattr(exc, "errno", None) else "the labels file is not one it keeps"
                raise BadRequest(f"the labels could not be kept: {why} (the backend's log names the file)",
                                 status=507) from None
        for path, (label, _) in rows.items():
            self.echo(f"kept {path}: {label}")
        for why in refused:
            self.echo(f"not kept: {why}")
        answer = {"status": "kept" if rows else "skipped", "kept": len(rows), "skipped": skipped, "held_out": held}
        return dict(answer, refused=refused) if refused else answer

    def label_of(self, task, annotation, config):
        """(path, class, digest, whether a held-out image) an annotation gives its task's image, or None
        where it gives none (cancelled, or no choice with the config's control)."""
        if is_true(annotation.get("was_cancelled")):
            return None
        controls = self.controls(config)
        results = annotation.get("result")
        picked = [r for r in results if isinstance(r, dict) and r.get("from_name") == controls.from_name] \
            if isinstance(results, list) else []
        if not picked:
            return None
        where = f"task {task_id(task)}"
        try:
            label = choice(picked[-1].get("value"), where)
        except UserError as exc:
            raise BadRequest(exc.message) from None
        if label not in self.model.classes:
            raise BadRequest(f"{where}: the class {label!r} is none of the checkpoint's ({', '.join(self.model.classes)})")
        try:
            path, image = task_image(task.get("data"), self.folder, self.root, controls.image_key)
        except Refused as exc:
            raise BadRequest(f"{where}: {exc}") from None
        digest = file_digest(image)
        place, _ = self.model.place(digest)
        if self.training is not None and place != "train":
            self.echo(f"{path}: " + ("a held-out image: its label is kept, never trained on" if place == "held-out"
                                     else "an image the checkpoint never had: its label is kept for label.py"))
        return path, label, digest, place == "held-out"

    def retrain(self):
        """Ask for a head on every label kept (those of the checkpoint's training images)."""
        labels = self.model.training_labels(self.labels.rows)
        if self.training is None or self.learning().startswith("does not learn live"):
            return {"learning": self.learning()}
        if labels:
            self.training.want(labels)
        return {"learning": f"a head on {len(labels)} labels is trained in the background" if labels else
                "no label of a training image kept yet"}


def is_task_id(value):
    """Whether a task id is one Label Studio sends (a number, or text): an object or a list is none."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def task_id(task):
    return repr(task.get("id", "?"))[:40] if isinstance(task, dict) else "?"
