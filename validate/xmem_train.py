"""xMem's CNN training run, for ``allocsim capture``: ``python validate/xmem_train.py MODEL OPTIMISER BATCH``.

The loop follows xMem's ``exp/trainer/train_loop.py`` (``conv_train_loop``, zero_grad mode 0): a
torchvision model with random weights, ``model.to(device)``, the optimiser class with lr 1e-3,
cross-entropy, StepLR(7, 0.1), and per batch ``zero_grad()``, inputs and labels ``.to(device)``,
forward, loss, backward, step, ``torch.max(outputs, 1)``, scheduler step, until the batch with index
3 (4 passes). The data are CIFAR-10's shapes at 86x86 (xMem resizes CIFAR-10 to 86x86): random
values, since only the sizes matter to the memory. Models are built as xMem's ``AllModels`` builds
them (``perf_estimator/models.py``). ``device`` is hard-coded to ``cuda`` as in a user's script.
"""

from __future__ import annotations

import sys

import torch
import torchvision
from torchvision.models.mobilenetv3 import InvertedResidualConfig

device = torch.device("cuda")
ITERATIONS = 3          # xMem's target_iteration: the loop breaks after the batch with this index
IMAGE_SIZE = 86


def _ir(spec):
    return [InvertedResidualConfig(i, k, e, o, se, act, s, 1, width_mult=1.0) for i, k, e, o, se, act, s in spec]


_V3_SMALL = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
             (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
             (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
             (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1)]
_V3_LARGE = [(16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
             (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
             (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
             (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
             (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1)]

MODELS = {
    "VGG11": lambda: torchvision.models.vgg11(weights=None),
    "VGG16": lambda: torchvision.models.vgg16(weights=None),
    "VGG19": lambda: torchvision.models.vgg19(weights=None),
    "ResNet50": lambda: torchvision.models.resnet50(weights=None),
    "ResNet101": lambda: torchvision.models.resnet101(weights=None),
    "ResNet152": lambda: torchvision.models.resnet152(weights=None),
    "MobileNetV2": lambda: torchvision.models.mobilenet_v2(weights=None),
    "MobeNetV3Small": lambda: torchvision.models.MobileNetV3(_ir(_V3_SMALL), last_channel=1024, num_classes=10),
    "MobeNetV3Large": lambda: torchvision.models.MobileNetV3(_ir(_V3_LARGE), last_channel=1280, num_classes=10),
    "MnasNet": lambda: torchvision.models.MNASNet(alpha=1.0, num_classes=10),
    "ConvNeXtTiny": lambda: torchvision.models.convnext_tiny(weights=None),
    "ConvNeXtBase": lambda: torchvision.models.convnext_base(weights=None),
    "RegNetX400MF": lambda: torchvision.models.regnet_x_400mf(weights=None),
    "RegNetX32GF": lambda: torchvision.models.regnet_x_32gf(weights=None),
    "RegNetY400MF": lambda: torchvision.models.regnet_y_400mf(weights=None),
    "RegNetY32GF": lambda: torchvision.models.regnet_y_32gf(weights=None),
}


class RandomCifar(torch.utils.data.Dataset):
    """CIFAR-10 at 86x86: a float image and an int64 label per item, random values."""

    def __init__(self, n_items: int):
        self.n_items = n_items

    def __len__(self):
        return self.n_items

    def __getitem__(self, index):
        return torch.rand(3, IMAGE_SIZE, IMAGE_SIZE), int(index % 10)


def main(model_name: str, optimiser: str, batch_size: int) -> None:
    model = MODELS[model_name]()
    loader = torch.utils.data.DataLoader(RandomCifar(batch_size * (ITERATIONS + 1)), batch_size=batch_size)
    model.to(device)
    model.train()
    optimizer = getattr(torch.optim, optimiser)(params=model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)
    for index, (inputs, labels) in enumerate(loader):
        optimizer.zero_grad()
        inputs, labels = inputs.to(device), labels.to(device)
        with torch.set_grad_enabled(True):
            outputs = model(inputs)
            loss_value = criterion(outputs, labels)
            loss_value.backward()
            optimizer.step()
        _, preds = torch.max(outputs, 1)
        scheduler.step()
        if index >= ITERATIONS:
            break


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
