"""A frozen trunk's features of images known by the digest of their files' bytes: a checkpoint's own
images (training, then test) take the features kept since training (train/embeddings.py), any other
image's are computed by the trunk. evaluate.py --predict's heads (unseen.py) and serve.py's answers
(label/live_model.py) take them alike."""
import numpy as np
import torch

from ..data.cache_rows import SortedRows
from ..data.mapped import release_pages
from ..data.views import normalization, normalize


class KeptFeatures:
    """The kept features of a dataset (data.features, data.digests) and the checkpoint's network
    (`model`, whose trunk computes the others)."""

    def __init__(self, data, model, config, device):
        self.data, self.model, self.device = data, model, device
        self.mean, self.std = normalization(config, device)
        self.n_train = len(data.train_y)
        self.kept = None if not data.digests else SortedRows(np.concatenate([np.asarray(data.digests[part](), "S32")
                                                                             for part in ("train", "test")]))

    def rows(self, digests):
        """The row of each digest (hex, str or bytes) among the training then test images; -1 where
        none (or the dataset has no files)."""
        if self.kept is None or not len(digests):
            return np.full(len(digests), -1)
        return self.kept.rows(np.array([d.encode() if isinstance(d, str) else d for d in digests], "S32"))

    def features(self, x, rows):
        """The trunk's features (n, D) of uint8 images x at these rows (self.rows): the kept ones where
        a row is known, else computed from x (only those images of x are read)."""
        features = torch.empty(len(rows), self.data.features.train.shape[-1])
        kept = rows >= 0
        for part, mine in (("train", kept & (rows < self.n_train)), ("test", rows >= self.n_train)):
            if mine.any():
                at = rows[mine] - (self.n_train if part == "test" else 0)
                kept_features = getattr(self.data.features, part)
                features[torch.from_numpy(mine)] = kept_features[torch.from_numpy(at), 0].float()
                release_pages(kept_features)  # a batch's pages, not the whole mapped file
        if (~kept).any():
            images = normalize(x[torch.from_numpy(~kept)].to(self.device), self.mean, self.std)
            with torch.no_grad():
                features[torch.from_numpy(~kept)] = self.model.features(images).float().cpu()
        return features
