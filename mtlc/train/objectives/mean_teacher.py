"""Mean Teacher's objective (Tarvainen and Valpola 2017; the paper's Eq. 1-2): the student's class
probabilities pulled towards the EMA teacher's on another weak view of the same image, labeled and
unlabeled images alike, by their mean squared difference."""
import torch.nn.functional as F

from .base import Objective


def consistency_loss(student_logits, teacher_logits):
    """MSE between the class probabilities (Eq. 1), mean over classes and images; teacher detached."""
    return F.mse_loss(F.softmax(student_logits.float(), 1), F.softmax(teacher_logits.detach().float(), 1))


class MeanTeacher(Objective):
    name, title = "mt", "MT"
    help = ("Mean Teacher's (Eq. 1): the student's class probabilities near the EMA teacher's on another view of "
            "the image.")
    defaults = dict(cons_weight=100.0, unlabeled_batch=128)

    def unlabeled_loss(self, logits, target_logits, n_labeled):
        return consistency_loss(logits, target_logits), target_logits[n_labeled:].argmax(1), self.no_metrics()
